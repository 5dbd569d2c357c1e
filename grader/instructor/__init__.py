"""The instructor's tools: the skeleton generated from the reference, and the student release."""
