"""Gradescope: grading one submission in its container, and the autograder bundle."""
