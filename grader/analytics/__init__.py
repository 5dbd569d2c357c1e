"""The batch's item analytics for course staff: numbers (from every result in OUT) and page
(report.html and analytics.json)."""
