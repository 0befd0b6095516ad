"""collector.export"""
