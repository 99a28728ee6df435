// tlogcheck verifies svattn's transparency-log artifacts with Go's
// golang.org/x/mod/sumdb/note and golang.org/x/mod/sumdb/tlog, which share no
// code with svattn. It is built and run by tests/exact/test_tlog_independent.py.
//
//	tlogcheck note VKEY NOTE                      a signed note opens under VKEY
//	tlogcheck proof VKEY PROOF ENTRY              a c2sp.org/tlog-proof@v1 file proves ENTRY
//	tlogcheck consistency VKEY OLD NEW PROOF      checkpoint NEW extends OLD (PROOF: base64 lines)
//
// Exit 0 and "ok ..." when accepted, 1 and the reason when refused, 2 on usage.
package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func fail(format string, args ...interface{}) {
	fmt.Printf("refused: "+format+"\n", args...)
	os.Exit(1)
}

func read(path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	return data
}

func hash(line string) tlog.Hash {
	raw, err := base64.StdEncoding.DecodeString(line)
	if err != nil || len(raw) != tlog.HashSize {
		fail("not a base64 SHA-256 hash: %q", line)
	}
	var h tlog.Hash
	copy(h[:], raw)
	return h
}

// checkpoint opens a signed checkpoint note and parses its body (origin, size, root).
func checkpoint(vkey string, msg []byte) (string, int64, tlog.Hash) {
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		fmt.Println("bad verifier key:", err)
		os.Exit(2)
	}
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		fail("note: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(n.Text, "\n"), "\n")
	if len(lines) < 3 {
		fail("checkpoint has %d lines", len(lines))
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || strconv.FormatInt(size, 10) != lines[1] {
		fail("checkpoint size %q", lines[1])
	}
	return lines[0], size, hash(lines[2])
}

func main() {
	if len(os.Args) < 4 {
		fmt.Println("usage: tlogcheck note|proof|consistency VKEY ...")
		os.Exit(2)
	}
	vkey := string(read(os.Args[2]))
	switch os.Args[1] {
	case "note":
		n, err := note.Open(read(os.Args[3]), note.VerifierList(mustVerifier(vkey)))
		if err != nil {
			fail("note: %v", err)
		}
		fmt.Printf("ok note signed by %s (%d other signatures ignored)\n", n.Sigs[0].Name, len(n.UnverifiedSigs))
	case "proof":
		text := string(read(os.Args[3]))
		entry := read(os.Args[4])
		split := strings.Index(text, "\n\n")
		if split < 0 {
			fail("proof: no blank line")
		}
		lines := strings.Split(text[:split], "\n")
		if lines[0] != "c2sp.org/tlog-proof@v1" {
			fail("proof: header %q", lines[0])
		}
		lines = lines[1:]
		if len(lines) > 0 && strings.HasPrefix(lines[0], "extra ") {
			lines = lines[1:]
		}
		if len(lines) == 0 || !strings.HasPrefix(lines[0], "index ") {
			fail("proof: no index line")
		}
		index, err := strconv.ParseInt(strings.TrimPrefix(lines[0], "index "), 10, 64)
		if err != nil {
			fail("proof: index %q", lines[0])
		}
		var p tlog.RecordProof
		for _, l := range lines[1:] {
			p = append(p, hash(l))
		}
		origin, size, root := checkpoint(vkey, []byte(text[split+2:]))
		if index < 0 || index >= size {
			fail("proof: index %d outside a tree of %d", index, size)
		}
		if err := tlog.CheckRecord(p, size, root, index, tlog.RecordHash(entry)); err != nil {
			fail("inclusion: %v", err)
		}
		fmt.Printf("ok entry %d included in %s at size %d\n", index, origin, size)
	case "consistency":
		o1, n1, h1 := checkpoint(vkey, read(os.Args[3]))
		o2, n2, h2 := checkpoint(vkey, read(os.Args[4]))
		if o1 != o2 {
			fail("consistency: origins %q and %q differ", o1, o2)
		}
		var p tlog.TreeProof
		for _, l := range strings.Split(strings.TrimSuffix(string(read(os.Args[5])), "\n"), "\n") {
			if l != "" {
				p = append(p, hash(l))
			}
		}
		if err := tlog.CheckTree(p, n2, h2, n1, h1); err != nil {
			fail("consistency: %v", err)
		}
		fmt.Printf("ok %s: size %d extends size %d\n", o1, n2, n1)
	default:
		fmt.Println("unknown mode", os.Args[1])
		os.Exit(2)
	}
}

func mustVerifier(vkey string) note.Verifier {
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		fmt.Println("bad verifier key:", err)
		os.Exit(2)
	}
	return v
}
