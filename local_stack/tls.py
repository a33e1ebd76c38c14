"""The local stack's own certificate authority, for a broker that takes SASL_SSL: a CA made
once, when the stack's broker first starts, which signs the brokers' certificate (for
127.0.0.1 and localhost). Clients trust the CA's certificate (``ca.pem``, a PEM trust store
for librdkafka and Java alike); the CA's private key is thrown away once it has signed.

Made with the JDK's ``keytool``, which the stack's broker needs anyway: nothing else to
install, nothing downloaded.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from eventfold.local_stack.java import java_binary
from eventfold.local_stack.process import StackError

CA_FILE = "ca.pem"
KEYSTORE_FILE = "broker.p12"
PASSWORD_FILE = "broker.password"
VALID_DAYS = "3650"
SUBJECT_NAMES = "SAN=ip:127.0.0.1,dns:localhost"


@dataclass(frozen=True)
class BrokerTls:
    """Where a broker finds its key and certificate, and what its clients trust."""

    ca_location: Path
    keystore_location: Path
    keystore_password: str

    @classmethod
    def ensure(cls, directory: Path) -> BrokerTls:
        """The stack's CA and broker keystore in ``directory``, made if absent."""
        tls = cls(directory / CA_FILE, directory / KEYSTORE_FILE,
                  _read(directory / PASSWORD_FILE))
        if tls.keystore_password and tls.ca_location.exists() and (
                tls.keystore_location.exists()):
            return tls
        return _issue(directory)

    def server_properties(self) -> dict[str, str]:
        """A broker's keystore, and the trust store its own inter-broker client uses."""
        return {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.keystore_location),
            "ssl.keystore.password": self.keystore_password,
            "ssl.key.password": self.keystore_password,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_location),
        }


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _issue(directory: Path) -> BrokerTls:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    password = secrets.token_hex(16)
    ca_store, request, signed = (directory / "ca.p12", directory / "broker.csr",
                                 directory / "broker.pem")
    tls = BrokerTls(directory / CA_FILE, directory / KEYSTORE_FILE, password)
    for stale in (ca_store, tls.keystore_location, tls.ca_location):
        stale.unlink(missing_ok=True)
    ca = ["-keystore", str(ca_store), "-storetype", "PKCS12", "-storepass", password]
    broker = ["-keystore", str(tls.keystore_location), "-storetype", "PKCS12",
              "-storepass", password]
    key = ["-keyalg", "RSA", "-keysize", "2048", "-validity", VALID_DAYS, "-keypass", password]
    try:
        _keytool("-genkeypair", "-alias", "ca", "-dname", "CN=eventfold local stack CA",
                 "-ext", "bc:c", *key, *ca)
        _keytool("-exportcert", "-rfc", "-alias", "ca", "-file", str(tls.ca_location), *ca)
        _keytool("-genkeypair", "-alias", "broker", "-dname", "CN=localhost",
                 "-ext", SUBJECT_NAMES, *key, *broker)
        _keytool("-certreq", "-alias", "broker", "-file", str(request), *broker)
        _keytool("-gencert", "-alias", "ca", "-rfc", "-infile", str(request),
                 "-outfile", str(signed), "-ext", SUBJECT_NAMES, "-validity", VALID_DAYS, *ca)
        _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(tls.ca_location),
                 *broker)
        _keytool("-importcert", "-alias", "broker", "-file", str(signed), *broker)
    finally:
        for scratch in (ca_store, request, signed):  # the CA's key signs nothing more
            scratch.unlink(missing_ok=True)
    password_file = directory / PASSWORD_FILE
    password_file.touch(mode=0o600)
    password_file.write_text(password)
    tls.ca_location.chmod(0o644)
    return tls


def _keytool(*arguments: str) -> None:
    keytool = Path(java_binary()).with_name("keytool")
    result = subprocess.run([str(keytool), *arguments], capture_output=True, text=True,
                            timeout=60, check=False)
    if result.returncode != 0:
        raise StackError(f"making the local stack's certificates failed (keytool "
                         f"{arguments[0]}): {(result.stdout + result.stderr)[-1000:]}")
