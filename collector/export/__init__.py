"""tailtrace.collector.export"""
