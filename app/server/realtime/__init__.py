"""OpenAI's Realtime transcription API on a WebSocket, with voice activity detection in the gateway."""
