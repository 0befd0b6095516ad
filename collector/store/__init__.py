"""collector.store"""
