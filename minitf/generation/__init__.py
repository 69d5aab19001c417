"""Generation's arguments, checked, and the stop strings that cut its text.

What generate.py leans on besides the model and the sampler: its arguments, checked (`args`:
the prompt's ids, the sampling settings, the types of what it is given) and the stop strings that
cut its text (`stop_strings`)."""
