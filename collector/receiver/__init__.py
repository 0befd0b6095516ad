"""collector.receiver"""
