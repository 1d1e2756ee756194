"""The bottom layer: units (bytes, bandwidth, counts), the errors a user sees, the PNG writer.

Every other package may import these; they import nothing of recipegen.
"""
