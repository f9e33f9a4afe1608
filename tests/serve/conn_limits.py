"""Connection limits of `ds41 serve` (started with --max-connections 8 --max-connections-per-ip 4):
  conn_limits.py PORT
Idle connections from 127.0.0.1 up to the per-address limit; the next one from that address is
closed at once (within 2 s, no answer), while a request from 127.0.0.2 is answered; idle
connections from 127.0.0.2 then fill the total, and one from 127.0.0.3 is closed at once; when
the idle ones go, 127.0.0.1 is served again."""
import socket, sys, time

port = int(sys.argv[1])
def ok(name, cond, why=""):
    print(("PASS %s" % name) if cond else ("FAIL %s: %s" % (name, why)))

def idle(src):
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")   # headers never end
    return s

def closed_at_once(src):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(2)
    t0 = time.time()
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = s.recv(100)
    except (ConnectionResetError, BrokenPipeError):
        data = b""
    except socket.timeout:
        return False, "no answer within 2 s (hung)"
    finally:
        s.close()
    return data == b"" and time.time() - t0 < 2, "got %r" % data[:40]

def served(src):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    try:
        while True:
            c = s.recv(4096)
            if not c: break
            data += c
    except socket.timeout:
        pass
    s.close()
    return data.startswith(b"HTTP/1.1 200")

held = [idle("127.0.0.1") for _ in range(4)]
time.sleep(0.3)
c, why = closed_at_once("127.0.0.1")
ok("conn_per_ip_limit_closes_at_once", c, why)
ok("conn_other_address_served", served("127.0.0.2"))
time.sleep(0.5)   # the served connection's close is counted when its thread ends
held += [idle("127.0.0.2") for _ in range(4)]
time.sleep(0.3)
c, why = closed_at_once("127.0.0.3")
ok("conn_total_limit_closes_at_once", c, why)
for s in held: s.close()
time.sleep(0.5)
ok("conn_served_after_release", served("127.0.0.1"))
