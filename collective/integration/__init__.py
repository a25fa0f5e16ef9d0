"""Where TensorFlow is intercepted: the replacements :mod:`.replacements` lists, and what they call.

Importing this package, or any module in it but :mod:`.replacements`, registers and installs nothing.
"""
