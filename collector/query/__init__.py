"""tailtrace.collector.query"""
