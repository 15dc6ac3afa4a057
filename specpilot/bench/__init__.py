"""`specpilot bench`: workloads, AR vs stock vs configurations side by side, synthetic acceptance, reports
(a leaf: the core never imports it)."""
