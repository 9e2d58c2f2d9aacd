"""Notebook 04's question: which fix scenario makes the failure go away, at what cost?"""
