"""The old name of the service client, for tests and scripts left in this
folder (the client is sluice.client, bindings/python/sluice/client.py,
installed with the package): `from sluice_serve import Client` gets the
package's module itself, every name included. Found on sys.path because
pytest (and a script run from here) puts this folder first."""
import sys

import sluice.client

sys.modules[__name__] = sluice.client
