"""The placement protocol's state machines (pure: events in, actions out, time as an argument):
claims and leases (:mod:`.claims`), whom an owner offers a job to (:mod:`.targets`: best fit,
then least loaded), the worker's bookkeeping (:mod:`.worker`, :mod:`.worker_msgs`),
gang attempts (:mod:`.gang`) and hold rounds (:mod:`.holds`)."""
