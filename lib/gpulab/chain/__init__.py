"""The chain: layered parameters (`params`), the papermill runner (`runner`) and the run's index (`index`)."""
