"""The viewer: XProf's own server over every run's sessions (`xdiag view`), and links into it from reports."""
