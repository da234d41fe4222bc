mod dynamo;
mod engine;
