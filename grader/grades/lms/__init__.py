"""The files each LMS imports back: grades and feedback, in each LMS's own format (grader.grades.lms.imports)."""
