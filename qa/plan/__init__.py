"""Planning before compute: the power plan of a run and `qa plan`'s sample sizes."""
