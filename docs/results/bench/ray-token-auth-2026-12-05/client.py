import logging, sys, time, traceback
import ray
t = time.time()
try:
    ray.init(address=sys.argv[1], logging_level=logging.WARNING)
    print("CONNECTED", ray.cluster_resources())
    ray.shutdown()
except BaseException as exc:
    print("EXC after %.1fs" % (time.time() - t))
    print("TYPE", type(exc).__module__, type(exc).__qualname__, [c.__qualname__ for c in type(exc).__mro__])
    print("STR", repr(str(exc)))
    print("CAUSE", repr(exc.__cause__), "CONTEXT", repr(exc.__context__))
