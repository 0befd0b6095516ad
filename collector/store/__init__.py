"""tailtrace.collector.store"""
