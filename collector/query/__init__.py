"""collector.query"""
