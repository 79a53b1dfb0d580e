"""Multi-GPU Lab helpers: what the notebooks need that is not the lesson."""
