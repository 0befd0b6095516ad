"""tailtrace.collector.processor"""
