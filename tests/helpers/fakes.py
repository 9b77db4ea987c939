"""Stand-ins for framework objects: cyctx recognises torch, CuPy or cuda.core objects by the
module of their type and their attributes, never by importing the framework, so an instance
of a made-up class with the right __module__ is enough."""


def fake(module, name, **attrs):
    """An instance of a new class `name` of module `module`, with the given attributes."""
    cls = type(name, (), {"__module__": module})
    obj = cls()
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj
