#!/usr/bin/env bash
# ds41 chat on a terminal (issue 26 item 3), driven through a pseudo-terminal by python3's pty
# module on the random tiny serving checkpoint (4096-token context, so an answer runs long
# enough to interrupt):
#   - line editing: "hllo", three Left arrows, "e" sends "hello"; Up recalls it (history);
#   - Ctrl-C while an answer streams stops it, the program stays and prompts again; Ctrl-C at
#     the prompt does not quit; Ctrl-D quits with status 0;
#   - /help, /system TEXT, /save FILE: the saved messages JSON holds the system message, both
#     user messages and the two (partial, non-empty) answers; an unknown command is named;
#   - the history file is written under XDG_STATE_HOME;
#   - progress: nothing on stderr over a pipe; with DS41_PROGRESS=1 DS41_PROGRESS_AFTER=0 the
#     loading line is drawn and erased.
# Every wait is bounded (10-20 s); the child is killed on any failure. About 5 s.
set -u
cd "${DS41_ROOT:-$(dirname "$0")/..}"
DS41=${DS41:-./ds41}
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-chattty.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CK"
export XDG_CACHE_HOME="$TMP/cache"
. tests/lib.sh
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

ck=$(serve_checkpoint) || { fail chat_tty_checkpoint "cannot write the serving checkpoint"; exit 0; }

if ! "$DS41" chat --help 2>/dev/null | grep -q 'Examples:'; then
    fail chat_help_examples "ds41 chat --help has no examples"
else
    pass chat_help_examples
fi

"$PY" - "$DS41" "$ck" "$TMP" <<'EOF'
import os, pty, sys, time, json, signal, select
ds41, ck, tmp = sys.argv[1:4]
env = dict(os.environ, TERM="xterm", HOME=tmp + "/home", XDG_STATE_HOME=tmp + "/state", DS41_PROGRESS="0")
pid, fd = pty.fork()
if pid == 0:
    os.execve(ds41, [ds41, "chat", "-m", ck, "-n", "3000", "-c", "4096", "--spec", "off"], env)
buf = b""
def read_for(t):
    global buf
    end = time.time() + t
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                return False
            if not d:
                return False
            buf += d
    return True
def wait_for(pat, t=20.0, start=0):
    end = time.time() + t
    while time.time() < end:
        if pat in buf[start:]:
            return True
        if not read_for(0.05):
            return pat in buf[start:]
    return False
exited = []
def wait_answer(start, t=20.0):
    """the echoed line's newline after start, then answer bytes after it (streamed tokens): 8
    bytes, or a shorter answer that ended (the answer is sampled: " Jf" and the end of sequence
    happened) and the next prompt after it"""
    if not wait_for(b"\n", t, start):
        return False
    nl = buf.find(b"\n", start) + 1
    def done():
        return len(buf) >= nl + 8 or buf.find(b"\r\n> ", nl) > nl
    end = time.time() + t
    while time.time() < end and not done():
        if not read_for(0.05):
            break
    return done()
def alive():
    if exited:
        return False
    try:
        p, s = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    if p:
        exited.append(s)
    return p == 0
results = []
def check(name, ok, why):
    results.append(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, why)))
try:
    check("chat_tty_prompt", wait_for(b"> "), "no prompt: %r" % buf[-200:])
    mark = len(buf)
    os.write(fd, b"hllo\x1b[D\x1b[D\x1b[De\r")
    # the answer streams: wait for some output after the echoed line, then Ctrl-C
    wait_answer(mark)
    os.write(fd, b"\x03")
    ok = wait_for(b"(stopped", 10, mark) and wait_for(b"> ", 10, buf.find(b"(stopped", mark))
    check("chat_tty_ctrl_c_stops_answer", ok and alive(), "after Ctrl-C: %r" % buf[mark:][-300:])
    mark = len(buf)
    os.write(fd, b"\x03")                       # Ctrl-C at the prompt
    read_for(0.5)
    check("chat_tty_ctrl_c_at_prompt", alive(), "the program exited")
    start = len(buf)
    os.write(fd, b"\x1b[A\r")                   # Up: the last line again
    answered = wait_answer(start) and b"hello" in buf[start:]
    os.write(fd, b"\x03")
    # Ctrl-C stops the recalled line's answer; a short answer may already have ended (it is
    # sampled), and then the Ctrl-C finds the prompt: either way a prompt follows the answer
    if wait_for(b"(stopped", 5, start):
        ok = answered and wait_for(b"> ", 10, buf.rfind(b"(stopped"))
    else:
        ok = answered and buf.rfind(b"> ") > buf.find(b"\n", start)
    check("chat_tty_history_recall", ok, "no second answer: %r" % buf[mark:][-300:])
    mark = len(buf)
    os.write(fd, b"/help\r")
    check("chat_tty_help", wait_for(b"/save FILE", 10, mark), "no help: %r" % buf[mark:][-300:])
    mark = len(buf)
    os.write(fd, b"/frobnicate\r")
    check("chat_tty_unknown_command", wait_for(b"unknown command '/frobnicate'", 10, mark), "%r" % buf[mark:][-300:])
    mark = len(buf)
    os.write(fd, ("/system Be brief.\r/save %s/conv.json\r" % tmp).encode())
    check("chat_tty_save", wait_for(b"saved 5 messages", 10, mark), "%r" % buf[mark:][-300:])
    os.write(fd, b"\x04")                       # Ctrl-D
    end = time.time() + 10
    while time.time() < end and alive():
        read_for(0.1)
    st = exited[0] if exited else None
    check("chat_tty_ctrl_d_quits", st is not None and os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, "status %r" % st)
    try:
        m = json.load(open(tmp + "/conv.json"))
        roles = [x["role"] for x in m]
        ok = (roles == ["system", "user", "assistant", "user", "assistant"] and m[0]["content"] == "Be brief."
              and m[1]["content"] == "hello" and m[3]["content"] == "hello" and m[2]["content"] and m[4]["content"])
        check("chat_tty_saved_conversation", ok, "%r" % m)
    except Exception as e:
        check("chat_tty_saved_conversation", False, repr(e))
    h = tmp + "/state/ds41/chat_history"
    check("chat_tty_history_file", os.path.exists(h) and "hello" in open(h, errors="replace").read(), "no %s" % h)
except Exception as e:
    check("chat_tty_driver", False, repr(e))
finally:
    try:
        os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
print("\n".join(results))
EOF

# progress: never over a pipe unless asked
printf 'hi\n' | "$DS41" chat -m "$ck" -n 2 >/dev/null 2>"$TMP/p0.err"
if grep -q $'\033' "$TMP/p0.err"; then fail chat_no_progress_on_pipe "escape sequences on stderr: $(cat -v "$TMP/p0.err" | head -c 200)"
else pass chat_no_progress_on_pipe; fi
printf 'hi\n' | DS41_PROGRESS=1 DS41_PROGRESS_AFTER=0 "$DS41" chat -m "$ck" -n 2 >/dev/null 2>"$TMP/p1.err"
if grep -q "loading $ck: " "$TMP/p1.err" && grep -q $'\r\033\\[K' "$TMP/p1.err"; then pass chat_progress_line
else fail chat_progress_line "no drawn and erased loading line: $(cat -v "$TMP/p1.err" | head -c 300)"; fi
