"""The run engine: the run store, launching and controlling runs, their supervisor and watch, the pre-launch gate."""

from backends import shipped

# Only the agent and the run supervisors import the run engine (a run's own stages sit below it): they use
# the dependencies the console shipped with them, whatever versions the host holds (`backends.shipped`).
shipped.vendor_first()
