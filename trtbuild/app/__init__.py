"""The application: the static typed Recipe, the pipeline that runs the stages, the stage registry, and
every rule that spans sections (preflight, crosschecks, data validation, the GPU plan, the bundle's
conformance to its release, the target structure). Imports the sections; nothing below imports it.
"""
