"""stepscope.innet"""
