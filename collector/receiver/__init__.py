"""tailtrace.collector.receiver"""
