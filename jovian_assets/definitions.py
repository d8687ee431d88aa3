"""The `jovian` code location: GPU serving images from the lab's source locks (runbook 004_43dc16d711c37290).

Empty until the rev-adoption graph lands (issue 4); it loads so the workspace has both locations.
"""

import dagster as dg

from resources.site import SiteResource

defs = dg.Definitions(resources={"site": SiteResource()})
