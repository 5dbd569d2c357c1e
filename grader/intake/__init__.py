"""From what a TA gives `grade` to hand-ins: which paths are LMS downloads and whose each file is
(download, find), and each hand-in unpacked safely with its code and its runs located (handin)."""
