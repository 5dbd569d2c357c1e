"""a4 grader: from hand-in zips to grades, feedback and Gradescope results."""

__version__ = "0.1.0"
