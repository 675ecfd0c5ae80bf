"""Option-order debiasing and calibration of decision answers, opt-in per question."""
