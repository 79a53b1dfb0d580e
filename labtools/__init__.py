"""Multi-GPU Lab's tools wing: what `make` runs around the lessons, never imported by one.

It executes the notebooks headlessly and reports (runner, run_folder, report, report_pages,
compare, ledger), refreshes what is derived from them (sync: catalog, translations, message
catalog, exported scripts, nbval recordings), hands out translation worksheets and student
copies, checks a GPU machine (gpucheck) and keeps a saved notebook clean in git (savehook).
The lesson kit is helpers/.
"""
