"""Final grades: the autograde results, the course's policy and the LMS (see grader.grades.book)."""
