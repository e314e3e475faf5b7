"""What a graph means for the real model: interventions, validation, QK and inactive-feature attribution.

intervene.py           constrained and iterative patching, steering, generation
validate.py            node-to-logit, feature-to-feature and faithfulness evaluations
validation_report.py   the validation report (markdown and plots)
stats.py               the correlation statistics the evaluations report
qk.py                  attention scores split into (query source, key source) pairs
inactive.py            what holds an inactive feature below threshold
"""
