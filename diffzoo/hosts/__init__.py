"""diffzoo.hosts: one module per host library whose models take diffzoo attention.

:mod:`diffzoo.hosts.timm` (timm's ``VisionTransformer`` attention adapters) and :mod:`diffzoo.hosts.open_clip`
(``nn.MultiheadAttention``'s call over diffzoo attention, for converted open_clip models). This package
imports neither; :mod:`diffzoo.hosts.timm` imports timm.
"""
