"""collector.processor"""
