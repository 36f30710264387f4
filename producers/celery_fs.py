"""kombu's filesystem transport with atomic message files (the embedded Celery broker).

kombu writes a message file in place (open, lock, write) while readers `shutil.move` it
away without taking the lock, so a reader can take a file before its bytes are in and
fail on empty JSON, which stops the whole Celery worker ("Unrecoverable error:
JSONDecodeError"). Seen here under load with several workers on one folder.

NOTE: this channel writes `<name>.msg.part` and renames it to `<name>.msg` (atomic on one
filesystem); readers only take names ending in `.<queue>.msg`, so they never see a
partial file. Everything else is kombu's.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class AtomicChannel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        part = final + ".part"
        try:
            with open(part, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(part, final)
        except OSError as exc:
            raise ChannelError(f"cannot add file {final!r} to the queue folder") from exc


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = AtomicChannel


TRANSPORT = f"{__name__}:AtomicFilesystemTransport"
