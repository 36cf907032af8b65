package bridgecmd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// envStrictCLI makes the test binary act as strictCLI instead of running
// the tests: the steering tests start it as the agent CLI.
const envStrictCLI = "JETCREW_TEST_STRICT_CLI"

// envStrictCLIFirstTurn is how long strictCLI's first turn (the prompt's)
// takes, as a Go duration.
const envStrictCLIFirstTurn = "JETCREW_TEST_STRICT_CLI_FIRST_TURN"

func TestMain(m *testing.M) {
	if os.Getenv(envStrictCLI) != "" {
		os.Exit(strictCLI())
	}
	os.Exit(m.Run())
}

// strictCLI is an agent CLI taking Claude Code's stream-json input, as
// strict as a CLI may be about the end of its input: it reads its input as
// it comes (lines queue while a turn runs), answers each user message with
// a turn of its own ({"type":"assistant",...} then {"type":"result",
// "result":"turn: TEXT"}), and once its input has ended it starts no
// further turn: what it read but had not begun is dropped. A launcher that
// closes the input while a steer it wrote still waits for its turn loses
// that steer here.
func strictCLI() int {
	first, _ := time.ParseDuration(os.Getenv(envStrictCLIFirstTurn))
	var (
		mu    sync.Mutex
		cond  = sync.NewCond(&mu)
		queue []string
		eof   bool
	)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			text, err := decodeClaudeTurn(sc.Bytes())
			mu.Lock()
			if err != nil {
				text = "bad input: " + err.Error()
			}
			queue = append(queue, text)
			cond.Broadcast()
			mu.Unlock()
		}
		mu.Lock()
		eof = true
		cond.Broadcast()
		mu.Unlock()
	}()
	out := bufio.NewWriter(os.Stdout)
	for n := 0; ; n++ {
		mu.Lock()
		for len(queue) == 0 && !eof {
			cond.Wait()
		}
		if eof {
			mu.Unlock()
			return 0
		}
		text := queue[0]
		queue = queue[1:]
		mu.Unlock()
		if n == 0 {
			time.Sleep(first)
		}
		b, _ := json.Marshal(text)
		r, _ := json.Marshal("turn: " + text)
		fmt.Fprintf(out, `{"type":"assistant","message":{"content":[{"type":"text","text":%s}]}}`+"\n", b)
		fmt.Fprintf(out, `{"type":"result","subtype":"success","result":%s}`+"\n", r)
		if err := out.Flush(); err != nil {
			return 1
		}
	}
}

// decodeClaudeTurn returns the text of one user message of Claude Code's
// stream-json input.
func decodeClaudeTurn(line []byte) (string, error) {
	var m struct {
		Type    string `json:"type"`
		Message struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"message"`
	}
	if err := json.Unmarshal(line, &m); err != nil || m.Type != "user" || len(m.Message.Content) != 1 {
		return "", fmt.Errorf("not a user message: %.80q", line)
	}
	return m.Message.Content[0].Text, nil
}
