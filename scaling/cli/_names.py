"""Names that verbs' --help lists but whose library home loads numpy, pandas or scipy on import.

Copies, so that `scaling fit --help` and `scaling optimal --help` import none of the fitting stack;
tests/cli/test_help.py checks each against its source.
"""

# scaling.study.analysis.laws.names(): the registered laws
LAWS = ("capacity", "capacity_roles", "chinchilla", "kumar", "kumar_data", "kumar_eff", "kumar_roles", "quartet", "recipe_gap", "sun")
# scaling.train.compute.COST_MODELS
COST_MODELS = ("bits", "nominal", "a100", "h100", "h800", "h200", "b200", "b300", "mi300x", "mi355x")
