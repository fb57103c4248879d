"""warmscope model: what every layer shares without I/O.

The records warmscope stores and reads back (:mod:`.records`), the metric and
attribute names (:mod:`.schema`) and the A/B moment arithmetic
(:mod:`.ab_metrics`). Nothing here imports another warmscope package.
"""
