"""The student tools: check a hand-in as the graders will, and package it."""
