"""Gradescope: grading one submission in its container, and the autograder bundle."""

# Where Gradescope's container puts a submission and its metadata, and where it reads the results:
# the defaults of grader.gradescope.run.grade_submission and of `python -m grader gradescope`.
SUBMISSION = "/autograder/submission"
RESULTS = "/autograder/results/results.json"
METADATA = "/autograder/submission_metadata.json"
