"""stepscope.perfmodel"""
