"""Multi-GPU Lab's tools wing: what `make` runs around the lessons, never imported by one.

It executes the notebooks headlessly and reports (runner, runs, report, render, compare,
ledger), builds what is derived from them (catalog, translations, worksheets, message catalog,
exported scripts, student copies), checks a GPU machine (gpucheck) and keeps a saved notebook
clean in git (savehook). The lesson kit is helpers/.
"""
