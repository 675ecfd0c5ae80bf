"""One module per route family: <family>.py reads the typed request and handles it,
<family>_wording.py holds its exact refusals, <family>_render.py its response and event shapes.
turns.py is what chat and responses share, decision_rules.py what the decision routes share."""
