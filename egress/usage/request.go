package usage

import (
	"bytes"
	"io"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// Detect returns the metered format of a request by its HTTP method and URL
// path (the path alone, without query; a query is ignored if present):
// POST to a path ending "/v1/messages" is messages.FormatAnthropic, and so
// is one containing "/publishers/anthropic/models/<model>" and ending
// ":rawPredict" or ":streamRawPredict" (Claude on Vertex AI, whose
// count-tokens model is no model request); ending "/chat/completions" is
// FormatOpenAIChat, ending "/responses" is FormatOpenAIResponses,
// containing "/models/" and ending ":generateContent" or
// ":streamGenerateContent" is FormatGemini (Gemini API and Vertex AI paths
// alike); ending "/v1internal:generateContent" or
// "/v1internal:streamGenerateContent" is FormatGeminiCodeAssist (Gemini
// CLI's login endpoint). Anything else is "": not a model request this
// package meters (Anthropic's /v1/messages/count_tokens, Gemini's
// :countTokens, a GET of a stored response).
func Detect(method, path string) string {
	if method != "POST" {
		return ""
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch {
	case strings.HasSuffix(path, "/v1/messages"):
		return messages.FormatAnthropic
	case strings.HasSuffix(path, "/chat/completions"):
		return messages.FormatOpenAIChat
	case strings.HasSuffix(path, "/responses"):
		return messages.FormatOpenAIResponses
	case strings.HasSuffix(path, "/v1internal:generateContent") || strings.HasSuffix(path, "/v1internal:streamGenerateContent"):
		return messages.FormatGeminiCodeAssist
	case strings.Contains(path, "/models/") &&
		(strings.HasSuffix(path, ":generateContent") || strings.HasSuffix(path, ":streamGenerateContent")):
		return messages.FormatGemini
	}
	if model, method := vertexAnthropic(path); model != "" && model != "count-tokens" &&
		(method == "rawPredict" || method == "streamRawPredict") {
		return messages.FormatAnthropic
	}
	return ""
}

// vertexAnthropicModels is the part of a Claude on Vertex AI path before
// the model (the Anthropic SDK's vertex middleware's).
const vertexAnthropicModels = "/publishers/anthropic/models/"

// vertexAnthropic returns the model and method of a Claude on Vertex AI
// path (…/publishers/anthropic/models/<model>:<method>), "" for another
// path.
func vertexAnthropic(path string) (model, method string) {
	i := strings.LastIndex(path, vertexAnthropicModels)
	if i < 0 {
		return "", ""
	}
	model, method, _ = strings.Cut(path[i+len(vertexAnthropicModels):], ":")
	if strings.Contains(model, "/") || strings.Contains(method, "/") {
		return "", ""
	}
	return model, method
}

// Request is what a model request says about itself (ReadRequest).
type Request struct {
	// Format is the request's format, as Detect returned it.
	Format string
	// Model is the model the request names: the body's "model"
	// (Anthropic, OpenAI, Code Assist), the path's models/<model> (Gemini,
	// Claude on Vertex AI); "" when unknown (a body past the bound or not
	// JSON).
	Model string
	// Stream is true when the request asks for a stream: the body's
	// "stream": true (Anthropic, OpenAI), a :streamGenerateContent or
	// :streamRawPredict path (Gemini, Code Assist, Claude on Vertex AI).
	Stream bool
	// IncludeUsage is true when an OpenAI Chat Completions request sets
	// stream_options.include_usage = true, without which a stream carries
	// no usage. It is false for every other format.
	IncludeUsage bool
}

// requestPath returns what a request of format to path says by its path:
// Gemini's model and method, Code Assist's method, Claude on Vertex AI's
// model and method.
func requestPath(format, path string) Request {
	req := Request{Format: format}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch format {
	case messages.FormatGemini:
		req.Model, req.Stream = geminiPath(path)
	case messages.FormatGeminiCodeAssist:
		req.Stream = strings.HasSuffix(path, ":streamGenerateContent")
	case messages.FormatAnthropic:
		var method string
		req.Model, method = vertexAnthropic(path)
		req.Stream = method == "streamRawPredict"
	}
	return req
}

// geminiPath returns the model of a Gemini path (…/models/<model>:<method>,
// without query) and whether the method streams.
func geminiPath(path string) (model string, stream bool) {
	i := strings.LastIndex(path, "/models/")
	if i < 0 {
		return "", false
	}
	rest := path[i+len("/models/"):]
	j := strings.LastIndexByte(rest, ':')
	if j < 0 {
		return "", false
	}
	return rest[:j], rest[j+1:] == "streamGenerateContent"
}

// replay is a request body that gives back the bytes ReadRequest read,
// then the error that stopped it (if any), then the rest of rc.
type replay struct {
	r   *bytes.Reader
	err error
	rc  io.ReadCloser
	// whole is the body when ReadRequest read it whole as a JSON object
	// (IncludeUsage rewrites it), else nil.
	whole []byte
}

// Read implements io.Reader.
func (b *replay) Read(p []byte) (int, error) {
	if b.r.Len() > 0 {
		return b.r.Read(p)
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.rc.Read(p)
}

// Close closes the original body.
func (b *replay) Close() error { return b.rc.Close() }
