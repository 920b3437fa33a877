"""``schedlab hunt``: search for the workload that breaks a policy, and shrink it to a reproducer.

A hunt file is an experiment whose ``[[runs]]`` are the policies to compare and whose
``[hunt]`` table says what to look for (:mod:`.config`): an objective over the runs of one
workload to maximise, or a property to falsify, within a space of workloads (:mod:`.space`)
and under honesty constraints. The search (:mod:`.optimize`, an evolution strategy) evaluates candidate
workloads through the study executor (:mod:`.evaluate`), beside random sampling of the same
bounds; the worst workload of the two (the search's on a tie) is shrunk by delta debugging
(:mod:`.shrink`) and written as a request file plus an experiment that replays it
(:mod:`.output`), with pictures (:mod:`.plots`). :mod:`.hunt` ties them together, :mod:`.report` writes the outcome, and
:mod:`.command` is the CLI.

MetaOpt (Namyar et al., NSDI'24) searches for inputs that maximise a heuristic's gap to the
optimum; this is the same question asked of a serving scheduler against another policy.
"""
