// Package usage reads the token usage model providers report in their
// responses, for the egress proxy that sees every model request of a run
// whose key it injects (issue 26). It knows five formats
// (messages.FormatAnthropic, FormatOpenAIChat, FormatOpenAIResponses,
// FormatGemini, FormatGeminiCodeAssist), told apart by the request's
// method and path (Detect); it reads the request's model, whether it
// asked for a stream and what it may cost (ReadRequest, Prices.Worst),
// then the response's usage as the response passes through (Wrap), prices
// it by an operator's table (Prices.Charge), and builds the provider's own
// errors for a request the proxy answers itself (QuotaError,
// PermissionError, RateLimitError, UpstreamError).
//
// Nothing here is ever an error for the agent: a body the package cannot
// read passes through unchanged and its usage is unknown (Result.Known
// false). Bytes are never held back: a server-sent event reaches the agent
// as soon as the provider sent it, and the usage is read from a copy of
// the bytes already passed on.
//
// What each provider reports, and so what is counted (messages.Tokens,
// Result.WebSearches):
//
//   - Anthropic Messages (and Claude on Vertex AI, the model in the
//     path): usage.input_tokens, output_tokens, cache_read_input_tokens,
//     cache_creation_input_tokens (of which
//     cache_creation.ephemeral_1h_input_tokens are CacheWrite1h) and
//     server_tool_use.web_search_requests. In a stream, message_start
//     carries message.usage and message.model, and each message_delta
//     carries usage counts that are cumulative totals for the whole
//     message, not increments; the latest non-zero value of each count is
//     kept, never a sum.
//   - OpenAI Chat Completions: usage.prompt_tokens (of which
//     prompt_tokens_details.cached_tokens are CacheRead and
//     cache_write_tokens CacheWrite, the rest Input) and completion_tokens
//     (reasoning included). A stream carries usage only when the request
//     set stream_options.include_usage = true: then a last chunk, with
//     empty choices, has it. Request.IncludeUsage tells a request that did
//     not ask apart beforehand; the proxy makes it ask (IncludeUsage) and
//     takes the chunk out of the answer its client reads (StripUsage).
//     Read as it was sent, such a stream's usage is unknown (Known false).
//   - OpenAI Responses: usage.input_tokens (split as Chat's, by
//     input_tokens_details) and output_tokens (output_tokens_details.
//     reasoning_tokens are already inside it); each web_search_call item
//     of the output is a web search. In a stream, the final event
//     (response.completed, or response.incomplete or response.failed, which
//     are billed too) carries the whole Response.
//   - Gemini generateContent and streamGenerateContent: usageMetadata's
//     promptTokenCount (of which cachedContentTokenCount is CacheRead) plus
//     toolUsePromptTokenCount as Input, candidatesTokenCount plus
//     thoughtsTokenCount as Output. Each chunk of a stream carries
//     usageMetadata so far (an early one may lack the output counts); the
//     last one seen is kept. A stream without alt=sse is one JSON array of
//     responses, read like a JSON body. Code Assist (Gemini CLI's login
//     endpoint) answers the same, each response wrapped as
//     {"response": ...}.
//
// A response whose body ends early (the agent closes it, the connection
// breaks) is counted with the usage seen so far: Known is true only when a
// usage object had already arrived, and the counts are then a lower bound
// (an Anthropic stream cut after message_start has its input tokens but
// not its final output count).
package usage
