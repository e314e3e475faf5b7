"""The graph engine: the frozen replacement model and the attribution methods built on it.

frozen.py            one frozen forward (recorded patterns and norm scales, MLPs swapped, hooks captured)
sets.py              which sets replace what: MLP transcoders, optionally attention-output SAEs
replacement.py       the local replacement model: record a prompt, run the frozen model on any sources
sources.py           source nodes, target injections, node table and provenance shared by the methods
targets.py           logit, logit-difference and direction targets
autograd_rows.py     the reference rows engine (one autograd backward per batch of targets)
linear_backward.py   the fast rows engine (the frozen backward as explicit matrix products)
csr_rows.py          the rows engines' sparse output
finite.py            NaN and inf refused in a forward's activations and in edge values
threads.py           thread counts chosen for the work (robust on a machine with other work on it)
methods.py           the attribution methods and the options each takes (checked before any work)
attribute.py         `attribute`: the full graph
hierarchical.py      `attribute_hierarchical`: detach-during-backward from one root
adaptive.py          `attribute_adaptive`: partial graphs within a feature budget
"""
