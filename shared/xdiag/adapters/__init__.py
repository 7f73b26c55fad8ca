"""Adapters for the ports: embedded (in-process, local files, memory) and Google Cloud."""
