"""What a run reports: metrics, goodput, summary.json (the result), run status and checkpoint listings."""
